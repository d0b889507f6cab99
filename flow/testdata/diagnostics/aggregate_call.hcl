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
    best    = max_by(msg.sku)  # ERROR: max_by takes 2 arguments, not 1. Such as max_by(msg.bidder, msg.price)
    cheap   = min_by(msg.sku, msg.amount, 2) # ERROR: min_by takes 2 arguments, not 3.
  }
}
sink "out" {
  kind  = "stdout"
  input = stage.revenue
}
