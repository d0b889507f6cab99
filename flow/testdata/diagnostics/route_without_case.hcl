pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
topic "rest" {}
stage "split" { # ERROR: Missing case block
  kind    = "route"
  input   = topic.orders
  default = topic.rest
}
sink "out" {
  kind  = "stdout"
  input = topic.rest
}
