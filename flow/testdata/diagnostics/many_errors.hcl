pipeline "t" {}
topic "orders" {
  partitions = 0 # ERROR: partitions must be at least 1
}
source "in" {
  kind   = "stdin"
  output = topic.ordrs # ERROR: Did you mean "orders"?
}
sink "out" {
  kind  = "stdot" # ERROR: Did you mean "stdout"?
  input = topic.orders
}
retry "r" {
  backoff = "square" # ERROR: "square" is not a valid backoff
}
