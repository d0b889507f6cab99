pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
stage "noop" { # WARNING: Map stage changes nothing
  kind  = "map"
  input = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = stage.noop
}
