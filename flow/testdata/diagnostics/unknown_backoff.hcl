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
  backoff = "exponental" # ERROR: "exponental" is not a valid backoff. Did you mean "exponential"? The values are "constant", "linear", "exponential".
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
  retry = retry.r
}
