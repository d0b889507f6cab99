# A global table whose keys are forgotten 10 minutes after their last update, in the time of their
# entries (no event_time), looked up by orders: for the tests of tables under flowrun test. Global,
# the table's two partitions go to one (customers.table.by_key), whose watermark any entry moves.
pipeline "ttl" {
  key_prefix = "ttl"
}

topic "customers" {
  partitions = 2
  key        = msg.customer_id
}

topic "orders" {
  partitions = 2
  key        = msg.order_id
}

table "customers" {
  input  = topic.customers
  ttl    = "10m"
  global = true
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
