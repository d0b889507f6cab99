pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
stage "score" {
  kind  = "go"
  func  = "acme.scor" # ERROR: No Go stage function "acme.scor" is registered in this flowrun binary. Did you mean "acme.score"?
  input = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = stage.score
}
