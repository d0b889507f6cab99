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
locals {
  token = env("FLOWRUN_TEST_SURELY_UNSET") # ERROR: the environment variable FLOWRUN_TEST_SURELY_UNSET is not set
}
