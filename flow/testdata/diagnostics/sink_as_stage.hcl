pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
sink "again" {
  kind  = "stdout"
  input = stage.out # ERROR: "out" is a sink, not a stage
}
