pipeline "t" {}
topic "orders" {
  partitons = 2 # ERROR: Did you mean "partitions"?
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
