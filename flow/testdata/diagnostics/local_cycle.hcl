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
  a = local.b + 1 # ERROR: Cycle in local values: The local values refer to each other in a cycle: local.a → local.b → local.a.
  b = local.a + 1
}
