pipeline "t" {}
topic "orders" {
  partitions = 0 # ERROR: partitions must be at least 1; it is 0.
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
