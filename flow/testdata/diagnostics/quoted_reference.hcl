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
  input = "orders" # ERROR: Invalid reference: input takes a reference to a topic or stage, written without quotes as topic.NAME or stage.NAME.
}
