pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
stage "enrich" {
  kind  = "map"
  input = topic.orders
  set = {
    a = 1
    a = 2 # ERROR: Duplicate field: The field "a" is already set at
  }
}
sink "out" {
  kind  = "stdout"
  input = stage.enrich
}
