pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
variable "k" {
  default = "map"
}
sink "out" {
  kind  = var.k # ERROR: The kind must be a literal string
  input = topic.orders
}
