pipeline "t" {
  max_message_size = "64" # ERROR: Invalid size: max_message_size: "64" has no unit; write "64B", "64KiB" or "64MiB".
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
