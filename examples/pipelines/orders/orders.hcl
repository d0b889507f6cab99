# The order events of the Redis streaming guide: a shop application XADDs events such as
#
#   XADD demo:events:orders * type order.placed order_id 1001 customer alice amount 42.50
#
# into one stream, and two independent consumers read all of them at their own pace: notifications
# (which tells customers what happened to their order) and analytics (which keeps a clean record for
# reporting). flowrun reads the stream once, through its own consumer group, and fans it out.

pipeline "orders" {
  key_prefix  = "orders"
  description = "Order events from the shop, read by a notifications stage and an analytics stage."
}

variable "stream" {
  type        = string
  default     = "demo:events:orders"
  description = "The stream the shop application appends its order events to."
}

variable "analytics_stream" {
  type        = string
  default     = "demo:analytics:orders"
  description = "Where the analytics records go, for the reporting jobs."
}

source "shop" {
  kind   = "redis_stream"
  stream = var.stream
  output = topic.orders
}

# Keyed by order, so that the events of one order are processed in the order they happened. Its
# schema says what an event holds: the source dead-letters an event that does not satisfy it, with
# the reason, and validate checks the stages' expressions against it (a misspelt msg.customer_id
# is an error there, with a suggestion, instead of a dead letter for every event).
topic "orders" {
  partitions = 4
  key        = msg.order_id
  schema     = file("${path.pipeline}/order.schema.json")

  retention {
    max_age = "7d"
  }
}
