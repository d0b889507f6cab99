pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
stage "enrich" {
  kind  = "mapp" # ERROR: There is no stage kind "mapp". Did you mean "map"? The kinds are "aggregate", "dedupe", "filter", "go", "join", "lookup", "map", "pattern", "rate_limit", "route".
  input = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
