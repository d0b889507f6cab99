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
variable "vat_rate" {
  default = 0.19
}
stage "tax" {
  kind  = "map"
  input = topic.orders
  set   = { total = msg.amount * (1 + var.vat_rat) } # ERROR: Did you mean "vat_rate"?
}
sink "taxed" {
  kind  = "stdout"
  input = stage.tax
}
