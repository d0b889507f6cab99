stage "enrich" {
  kind  = "map"
  input = topic.orders
  set   = { seen = true }
}

topic "orders" {
  partitions = 2
}

source "in" {
  kind   = "stdin"
  output = topic.ordrs # ERROR: Did you mean "orders"?
}
