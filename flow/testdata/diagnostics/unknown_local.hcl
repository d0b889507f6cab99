pipeline "t" {}
locals {
  parts = 4
}
topic "orders" {
  partitions = local.prats # ERROR: There is no local value named "prats". Did you mean "parts"?
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
