"""The gateway's surfaces, one room each; ``table`` joins their routes."""
