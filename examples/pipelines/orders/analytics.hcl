# Analytics: a typed record of every event, with the amount as a number of cents.

stage "analytics" {
  kind  = "map"
  input = topic.orders
  set = {
    event        = msg.type
    amount_cents = floor(tonumber(msg.amount) * 100 + 0.5)
    cancelled    = msg.type == "order.cancelled"
  }
  drop = ["type", "amount"]
}

sink "reporting" {
  kind   = "redis_stream"
  input  = stage.analytics
  stream = var.analytics_stream
}
