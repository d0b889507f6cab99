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
retry "r" {
  initial = "5 seconds" # ERROR: Invalid duration: initial: "5 seconds" is not a duration: unknown unit " seconds"
}
sink "again" {
  kind  = "stdout"
  input = topic.orders
  retry = retry.r
}
