# Webhooks in: a shop posts its order events over HTTP, and the pipeline enriches the paid ones and
# writes them to a file, one JSON line per order (examples/pipelines/shop writes them to
# PostgreSQL). Run it as a service:
#
#   flowrun run examples/pipelines/webhooks --var token=s3cret
#   curl -i http://127.0.0.1:8080/orders -H 'Authorization: Bearer s3cret' \
#     -H 'Content-Type: application/x-ndjson' -H 'Idempotency-Key: batch-1' \
#     --data-binary $'{"event":"order.paid","order_id":"1","customer":"alice","amount":"42.50","currency":"EUR"}\n'
#
# A request is answered 202, with its entries' IDs, once Redis has all of its events; a client that
# gets a 429 or a 503 sends the request again later with the same Idempotency-Key, which
# effectively-once delivery writes once.

pipeline "webhooks" {
  key_prefix = "webhooks"
  delivery   = "effectively_once"
}

variable "address" {
  type        = string
  default     = "127.0.0.1:8080"
  description = "Where the source listens: the loopback unless a host says otherwise."
}

variable "token" {
  type        = string
  default     = null
  sensitive   = true
  description = "The bearer token the shop sends with its requests; without one, requests need none (the address is the loopback's)."
}

variable "output" {
  type        = string
  default     = "paid-orders.jsonl"
  description = "Where the paid orders go."
}

locals {
  # Amounts arrive as decimal strings in the currency's unit.
  vat = { EUR = 0.2, GBP = 0.2, USD = 0 }
}

source "shop" {
  kind       = "http_server"
  output     = topic.order_events
  address    = var.address
  path       = "/orders"
  framing    = "auto"
  max_body   = "1MiB"
  auth_token = var.token
}

topic "order_events" {
  partitions = 4
  key        = msg.order_id
  max_lag    = 100000 # past it the source answers 429 and the shop tries again later
}

stage "paid" {
  kind  = "filter"
  input = topic.order_events
  where = msg.event == "order.paid"
}

stage "enrich" {
  kind  = "map"
  input = stage.paid
  set = {
    amount_cents = floor(tonumber(msg.amount) * 100 + 0.5)
    vat_cents    = floor(tonumber(msg.amount) * 100 * local.vat[msg.currency] + 0.5)
    customer     = lower(trimspace(msg.customer))
  }
  drop = ["event", "amount"]
}

sink "paid_orders" {
  kind  = "file"
  input = stage.enrich
  path  = var.output
}
