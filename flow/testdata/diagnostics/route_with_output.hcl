pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
topic "eu" {}
stage "split" {
  kind   = "route"
  input  = topic.orders
  output = topic.eu # ERROR: A route stage writes to the outputs of its case blocks and its default
  case {
    when   = msg.region == "eu"
    output = topic.eu
  }
}
sink "out" {
  kind  = "stdout"
  input = topic.eu
}
