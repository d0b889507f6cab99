pipeline "t" {}
topic "orders" {
  retention {
    max_age = "10ms" # ERROR: A max_age of 10ms would trim entries before consumers can read them
  }
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
