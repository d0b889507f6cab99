pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
stage "enrich" { # ERROR: Missing required argument: The argument "input" is required here
  kind = "filter"
  where = true
}
sink "out" {
  kind  = "stdout"
  input = stage.enrich
}
