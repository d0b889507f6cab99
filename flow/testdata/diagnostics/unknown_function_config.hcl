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
locals {
  n = lenght([1, 2]) # ERROR: There is no function named "lenght". Did you mean "length"?
}
