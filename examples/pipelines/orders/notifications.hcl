# Notifications: every event but order.placed tells the customer something.

stage "notifications" {
  kind  = "map"
  input = topic.orders
  set = {
    channel = msg.type == "order.shipped" ? "sms" : "email"
    to      = msg.customer
    text    = format("Your order %s is %s.", msg.order_id, local.wording[msg.type])
  }
  drop = ["amount"]
}

locals {
  wording = {
    "order.placed"    = "placed"
    "order.paid"      = "paid"
    "order.shipped"   = "on its way"
    "order.cancelled" = "cancelled"
  }
}

sink "notify" {
  kind  = "stdout"
  input = stage.notifications
  where = msg.type != "order.placed"
}
