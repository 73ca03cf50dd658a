"""What ``gptblock bench`` measures and how: timing, the matmul peak, the table."""
