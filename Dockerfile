# syntax=docker/dockerfile:1.7
# The image helm/txnwatch runs: Python, a JRE, txnwatch (its runtime dependencies, pyspark included) and Spark's
# Kafka connector jars, resolved at build time with the same POM and Maven settings as `make jars`. One image
# serves the collector, the Spark driver and the executors. It has not been built in this repository (no Docker
# on its machines); tests/ops/test_helm_image.py checks what can be checked without building (docs/deploy.md).
#
#   docker build -t registry.example.com/txnwatch:0.1.0 .

ARG PYTHON_VERSION=3.11

# --- Spark's Kafka connector and the runtime jars pyspark does not ship (`make jars`, spark/ half) -------------
FROM maven:3.9-eclipse-temurin-17 AS jars
WORKDIR /src
COPY dev/jvm/ dev/jvm/
RUN mvn -q -B -s dev/jvm/settings.xml -f dev/jvm/spark/pom.xml dependency:copy-dependencies \
        -DoutputDirectory=/jars/spark

# --- txnwatch and its runtime dependencies in a virtualenv (`make venv` without the dev extra, not editable) ----
FROM python:${PYTHON_VERSION}-slim-bookworm AS venv
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md txnwatch_cli.py ./
COPY detectors/ detectors/
COPY admin/ admin/
COPY streaming/ streaming/
RUN /opt/venv/bin/pip install --no-cache-dir .

# --- the runtime image ---------------------------------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim-bookworm
ARG PYTHON_VERSION
# Spark 4 runs on Java 17+; procps gives Spark's scripts `ps`.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java \
    && groupadd --gid 10001 txnwatch \
    && useradd --uid 10001 --gid 10001 --home-dir /home/txnwatch --create-home --shell /usr/sbin/nologin txnwatch
COPY --from=venv /opt/venv /opt/venv
COPY --from=jars /jars/spark /opt/txnwatch/jars/spark
# The SparkApplication's mainApplicationFile (local:///opt/txnwatch/txnwatch_cli.py).
COPY txnwatch_cli.py /opt/txnwatch/txnwatch_cli.py
# Spark on Kubernetes starts the driver and executor containers with `driver ...` / `executor`, as Spark's own
# images do (resource-managers/kubernetes/docker/.../entrypoint.sh); anything else is a txnwatch command.
COPY --chmod=0755 <<'EOF' /opt/txnwatch/entrypoint.sh
#!/bin/bash
set -euo pipefail
case "${1:-}" in
  driver)
    shift
    exec "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    # Spark passes the executor's JVM options as SPARK_JAVA_OPT_0, _1, ... in order.
    java_opts=()
    while IFS= read -r opt; do java_opts+=("$opt"); done < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
    exec "$JAVA_HOME/bin/java" "${java_opts[@]}" \
      -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
      -cp "$SPARK_HOME/jars/*:${SPARK_CLASSPATH:-}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" --cores "$SPARK_EXECUTOR_CORES" \
      --app-id "$SPARK_APPLICATION_ID" --hostname "$SPARK_EXECUTOR_POD_IP" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" --podName "${SPARK_EXECUTOR_POD_NAME:-}"
    ;;
  *)
    exec txnwatch "$@"
    ;;
esac
EOF
ENV PATH=/opt/venv/bin:$PATH \
    JAVA_HOME=/opt/java \
    SPARK_HOME=/opt/venv/lib/python${PYTHON_VERSION}/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python \
    TXNWATCH_STREAM__JARS_DIR=/opt/txnwatch/jars \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
USER 10001:10001
EXPOSE 9464 9465
ENTRYPOINT ["/opt/txnwatch/entrypoint.sh"]
CMD ["--help"]
