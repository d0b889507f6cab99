# A table whose keys are forgotten 10 minutes after their last update, in the time of their entries
# (no event_time), looked up by orders: for the tests of tables under flowrun test.
pipeline "ttl" {
  key_prefix = "ttl"
}

topic "customers" {
  partitions = 1
  key        = msg.customer_id
}

topic "orders" {
  partitions = 2
  key        = msg.order_id
}

table "customers" {
  input = topic.customers
  ttl   = "10m"
}

stage "enriched" {
  kind  = "lookup"
  input = topic.orders
  table = table.customers
  key   = msg.customer_id
  as    = "customer"
}

sink "out" {
  kind  = "stdout"
  input = stage.enriched
}
