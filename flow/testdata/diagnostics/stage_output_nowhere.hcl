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
stage "enrich" { # ERROR: Stage output goes nowhere
  kind  = "map"
  input = topic.orders
  set   = { seen = true }
}
