pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
stage "revenue" {
  kind     = "aggregate"
  group_by = msg.customer
  input    = topic.orders
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = {
    orders  = count()
    revenue = summ(msg.amount) # ERROR: There is no aggregate function "summ". Did you mean "sum"?
    top     = top_k(msg.sku)   # ERROR: top_k takes 2 arguments, not 1.
    total   = msg.amount       # ERROR: aggregate.total must call one of
  }
}
sink "out" {
  kind  = "stdout"
  input = stage.revenue
}
