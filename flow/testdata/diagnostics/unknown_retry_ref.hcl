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
  input = topic.orders
  retry = retry.standrad # ERROR: There is no retry block named "standrad". Did you mean "standard"?
}
