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
  kind  = "route"
  input = topic.orders
  case {
    when   = msg.region == "eu"
    output = topic.eu
  }
}
sink "out" {
  kind  = "stdout"
  input = stage.split # ERROR: Ambiguous stage output
}
sink "eu" {
  kind  = "stdout"
  input = topic.eu
}
