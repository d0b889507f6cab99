pipeline "t" {}
topic "orders" {
  partitions = vars.n # ERROR: There is no variable named "vars". Compile-time expressions can use var, local and path. Did you mean "var"?
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
sink "out" {
  kind  = "stdout"
  input = topic.orders
}
