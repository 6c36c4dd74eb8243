FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 KERAS_BACKEND=jax
WORKDIR /app
COPY pyproject.toml README.md ./
COPY scripts/bootstrap scripts/bootstrap
RUN pip install --no-cache-dir . && pip install --no-cache-dir --no-deps keras-hub==0.32.0
COPY . .
RUN useradd --create-home arena && chown -R arena /app
USER arena
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "arena_site.asgi:application"]
