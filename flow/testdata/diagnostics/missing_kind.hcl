pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
stage "enrich" { # ERROR: Missing stage kind: A stage needs a kind attribute; the kinds are "aggregate", "dedupe", "filter", "go", "join", "lookup", "map", "pattern", "rate_limit", "route".
  input = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
