"""The platform: config (the only reader of the environment), secrets, db, sqs, logs, errors."""
