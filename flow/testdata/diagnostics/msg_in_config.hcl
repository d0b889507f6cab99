pipeline "t" {}
topic "orders" {
  partitions = msg.n # ERROR: Per-message value not allowed here
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
