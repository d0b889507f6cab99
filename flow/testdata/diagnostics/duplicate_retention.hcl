pipeline "t" {}
topic "orders" {
  retention {
    max_len = 10
  }
  retention { # ERROR: Duplicate retention block
    max_len = 20
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
