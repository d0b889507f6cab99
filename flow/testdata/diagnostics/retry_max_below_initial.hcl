pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
retry "r" {
  initial = "10s"
  max     = "1s" # ERROR: max (1s) is shorter than initial (10s)
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
  retry = retry.r
}
