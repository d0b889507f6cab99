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
topic "archive" { # WARNING: Topic is never read
  partitions = 1
}
stage "copy" {
  kind   = "filter"
  input  = topic.orders
  output = topic.archive
  where  = true
}
