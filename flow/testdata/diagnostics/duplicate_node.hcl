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
stage "out" { # ERROR: A sink named "out" is already declared
  kind   = "filter"
  input  = topic.orders
  output = topic.orders
  where  = true
}
