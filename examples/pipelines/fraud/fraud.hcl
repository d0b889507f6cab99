# Card testing: someone with a stolen card number tries two small payments to see that it works,
# then a big one. A pattern stage finds, per card, two payments under 2 followed by one over 500
# within 10 minutes of event time, with any other payments of the card in between.
#
#   flowrun run --until-drained examples/pipelines/fraud --var output=bin/alerts.jsonl
#
# Payments wait in the card's state until the watermark is 30 seconds (grace) past them and then
# match in the order of their times, not of their arrival: a probe that arrives after the big
# payment it preceded still counts. A payment that arrives more than grace behind the watermark is
# late and goes to the late_payments topic, where a sink keeps it for a person to look at.

pipeline "fraud" {
  key_prefix  = "fraud"
  description = "Alerts for cards that were tested with small payments before a big one."
}

variable "payments" {
  type        = string
  default     = null
  description = "The payments, as JSON lines; the sample next to this file when not set."
}

variable "output" {
  type        = string
  default     = "alerts.jsonl"
  description = "Where the alerts go, a line each."
}

variable "late_output" {
  type        = string
  default     = "late-payments.jsonl"
  description = "Where late payments go, a line each."
}

source "payments" {
  kind   = "file"
  path   = coalesce(var.payments, "${path.pipeline}/data/payments.jsonl")
  output = topic.payments
}

# A card's payments share a partition: the pattern's state is the card's.
topic "payments" {
  partitions = 4
  key        = msg.card
}

topic "late_payments" {}

stage "card_testing" {
  kind       = "pattern"
  input      = topic.payments
  key        = msg.card
  event_time = msg.at
  sequence = [
    { name = "probe1", where = msg.amount < 2 },
    { name = "probe2", where = msg.amount < 2 },
    { name = "big", where = msg.amount > 500 },
  ]
  within = "10m"
  grace  = "30s"
  late   = topic.late_payments
  select = {
    card        = big.card
    amount      = big.amount
    merchant    = big.merchant
    first_probe = probe1.at
    payments    = [probe1.payment_id, probe2.payment_id, big.payment_id]
  }
}

sink "alerts" {
  kind  = "file"
  input = stage.card_testing
  path  = var.output
  mode  = "truncate" # a rerun of the job replaces what the last one wrote
}

sink "late" {
  kind  = "file"
  input = topic.late_payments
  path  = var.late_output
  mode  = "truncate"
}
