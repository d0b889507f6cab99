pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
stage "revenue" { # ERROR: The argument "group_by" is required here: The group a message counts in, such as group_by = msg.customer_id
  kind  = "aggregate"
  input = topic.orders
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { orders = count() }
}
sink "out" {
  kind  = "stdout"
  input = stage.revenue
}
