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
  jitter = 1.5 # ERROR: jitter must be at most 1; it is 1.5.
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
  retry = retry.r
}
