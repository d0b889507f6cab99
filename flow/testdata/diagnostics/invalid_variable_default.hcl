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
  input = topic.orders
}
variable "rate" {
  type    = number
  default = "fast" # ERROR: Invalid value for variable: The value from its default does not suit variable "rate"
}
