pipeline "t" {}
topic "orders" {
  partitions = 2.5 # ERROR: partitions must be a whole number; it is 2.5.
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
