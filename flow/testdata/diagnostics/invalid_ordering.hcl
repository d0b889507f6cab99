pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
stage "pass" {
  kind     = "filter"
  input    = topic.orders
  where    = true
  ordering = "keys" # ERROR: "keys" is not a valid ordering. Did you mean "key"?
}
sink "out" {
  kind  = "stdout"
  input = stage.pass
}
