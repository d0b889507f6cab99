pipeline "t" {
  max_message_size = "1GiB" # ERROR: Invalid value for max_message_size: max_message_size must be at most 512MiB; it is 1GiB.
}
topic "orders" {}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
