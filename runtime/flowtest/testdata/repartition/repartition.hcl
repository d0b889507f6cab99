# Orders keyed by region, counted per customer: the compiler inserts the repartition topic
# per_customer.by_key, keyed by customer, which both regions' partitions write.
pipeline "repartition" {}

topic "orders" {
  partitions = 2
  key        = msg.region # "north" is partition 0, "eu" partition 1
}

stage "per_customer" {
  kind       = "aggregate"
  input      = topic.orders
  group_by   = msg.customer
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = {
    orders = count()
  }
}

sink "out" {
  kind  = "stdout"
  input = stage.per_customer
}
