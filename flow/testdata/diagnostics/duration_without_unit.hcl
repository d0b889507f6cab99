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
stage "slow" {
  kind    = "filter"
  input   = topic.orders
  where   = true
  timeout = "30" # ERROR: "30" has no unit; write "30s", "30ms" or "30m"
}
sink "again" {
  kind  = "stdout"
  input = stage.slow
}
