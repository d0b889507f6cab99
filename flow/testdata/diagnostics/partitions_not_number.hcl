pipeline "t" {}
topic "orders" {
  partitions = "many" # ERROR: Invalid value for partitions
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
