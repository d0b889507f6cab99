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
  kind  = "map"
  input = topic.orders
  set   = { seen = true }
}
sink "out" {
  kind  = "stdout"
  input = stage.enrhc # ERROR: There is no stage named "enrhc". Did you mean "enrich"?
}
