# Retries and dead letters. Payments are validated and posted to a ledger's webhook.
#
# - A payment whose amount is not a number fails in the validate stage with an expression error.
#   Retrying cannot fix that, so it goes straight to the payments_failed topic.
# - A webhook call that fails (the ledger is down, answers 503 or 429) is retried with exponential
#   backoff; after five attempts the payment is dead-lettered with the attempts recorded.
# - The operator sees every dead letter on standard output, and can replay them with flowrun dlq.

pipeline "payments" {
  key_prefix = "payments"
}

variable "ledger_url" {
  type        = string
  default     = "http://127.0.0.1:8089/ledger"
  description = "The ledger's webhook."
}

variable "ledger_token" {
  type        = string
  default     = "dev-token-not-secret"
  sensitive   = true
  description = "The bearer token of the ledger's webhook."
}

variable "payments" {
  type    = number
  default = 20
}

retry "webhook" {
  max_attempts = 5
  backoff      = "exponential"
  initial      = "200ms"
  max          = "5s"
  jitter       = 0.2
}

retry "once" {
  max_attempts = 1
}

topic "payments" {
  partitions = 4
  key        = msg.account
}

topic "payments_failed" {
  partitions = 1
}

source "payments" {
  kind   = "generate"
  count  = var.payments
  output = topic.payments
  template = {
    id      = "pay-${index}"
    account = "acct-${index % 5}"
    # Every seventh payment carries an amount the ledger cannot take.
    amount = index % 7 == 3 ? "n/a" : tostring(index * 10 + 5)
  }
}

stage "validate" {
  kind        = "map"
  input       = topic.payments
  retry       = retry.once
  dead_letter = topic.payments_failed
  set = {
    amount_cents = tonumber(msg.amount) * 100
  }
  drop = ["amount"]
}

sink "ledger" {
  kind        = "http"
  input       = stage.validate
  url         = var.ledger_url
  headers     = { Authorization = "Bearer ${var.ledger_token}" }
  retry       = retry.webhook
  dead_letter = topic.payments_failed
}

sink "failures" {
  kind  = "stdout"
  input = topic.payments_failed
}
