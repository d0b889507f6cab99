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
  kind   = "map"
  input  = topic.orders
  where  = msg.amount > 1 # ERROR: A map stage has no argument "where"; it belongs to the filter kind of stage
  set    = { seen = true }
}
sink "out" {
  kind  = "stdout"
  input = stage.enrich
}
