pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
retry "standard" {}
sink "out" {
  kind  = "stdout"
  input = retry.standard # ERROR: Invalid reference
  retry = retry.standard
}
