# syntax=docker/dockerfile:1.7
# The images helm/txnwatch runs, two targets of one build:
#   stream     (the default: the last stage) Python, a JRE, txnwatch[stream] (pyspark), and Spark's Kafka connector
#              jars (with Amazon MSK's IAM login, aws-msk-iam-auth) resolved at build time with the same POM and
#              Maven settings as `make jars`. It serves the collector, the Spark driver and the executors; the
#              chart runs it everywhere.
#   collector  txnwatch, the core package without the stream extra (no JRE, pyspark, pyarrow or pandas):
#              `txnwatch collect`, `inspect` and `proposals`, none of which imports Spark. About a tenth of the size.
# The base images are build arguments. They default to the public ones; `make image` (dev/image.py) builds both
# targets with buildah from bases it makes out of Debian's packages, where no container registry is reachable.
#
#   docker build -t registry.example.com/txnwatch:0.2.0 .
#   docker build --target collector -t registry.example.com/txnwatch-collector:0.2.0 .
#
# Layers are ordered so that a source change reuses the jars, the Python dependencies and the JRE.

ARG PYTHON_VERSION=3.11
ARG PYTHON_IMAGE=python:${PYTHON_VERSION}-slim-bookworm
ARG MAVEN_IMAGE=maven:3.9-eclipse-temurin-17

# --- Spark's Kafka connector and the runtime jars pyspark does not ship (`make jars`, spark/ half) -------------
FROM ${MAVEN_IMAGE} AS jars
WORKDIR /src
COPY dev/jvm/ dev/jvm/
RUN mvn -q -B -s dev/jvm/settings.xml -f dev/jvm/spark/pom.xml dependency:copy-dependencies \
        -DoutputDirectory=/jars/spark

# --- pyproject.toml's runtime dependencies: the core package's, then the stream extra's on top ---------------
# The collector's include the extras both images carry (requirements.py's IMAGE_EXTRAS: msk, Amazon MSK IAM login).
FROM ${PYTHON_IMAGE} AS collector-deps
WORKDIR /src
COPY pyproject.toml deploy/image/requirements.py ./
RUN python -m venv /opt/venv \
    && python requirements.py collector < pyproject.toml > /tmp/requirements.txt \
    && python requirements.py extras < pyproject.toml >> /tmp/requirements.txt \
    && /opt/venv/bin/pip install --no-cache-dir -r /tmp/requirements.txt

FROM collector-deps AS stream-deps
RUN python requirements.py spark < pyproject.toml > /tmp/requirements.txt \
    && /opt/venv/bin/pip install --no-cache-dir -r /tmp/requirements.txt

# --- txnwatch itself, as a wheel (not editable, no dev extra) -------------------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md txnwatch_cli.py ./
COPY detectors/ detectors/
COPY common/ common/
COPY admin/ admin/
COPY streaming/ streaming/
RUN python -m venv /opt/build && /opt/build/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- the collector target ------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS collector
RUN groupadd --gid 10001 txnwatch \
    && useradd --uid 10001 --gid 10001 --home-dir /home/txnwatch --create-home --shell /usr/sbin/nologin txnwatch
COPY --from=collector-deps /opt/venv /opt/venv
COPY --from=wheel /wheels /tmp/wheels
# `pip install txnwatch[msk]`, from what collector-deps installed: --no-index fails the build if the wheel declares a
# dependency the venv lacks.
RUN whl="$(echo /tmp/wheels/*.whl)" \
    && /opt/venv/bin/pip install --no-cache-dir --no-index "${whl}[msk]" && rm -rf /tmp/wheels
COPY --chmod=0755 deploy/image/entrypoint.sh /opt/txnwatch/entrypoint.sh
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["/opt/txnwatch/entrypoint.sh"]
CMD ["--help"]
# Last, so that a new revision reuses every layer above (docker's cache keys RUN steps on the ARGs before them).
ARG VERSION=0.2.0
ARG REVISION=
ARG SOURCE=
LABEL org.opencontainers.image.title="txnwatch-collector" \
      org.opencontainers.image.description="txnwatch collect and txnwatch proposals, without Spark" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"

# --- the stream target (the default) -------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS stream
ARG PYTHON_VERSION
# Spark 4 runs on Java 17+; procps gives Spark's scripts `ps`.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java \
    && groupadd --gid 10001 txnwatch \
    && useradd --uid 10001 --gid 10001 --home-dir /home/txnwatch --create-home --shell /usr/sbin/nologin txnwatch
COPY --from=jars /jars/spark /opt/txnwatch/jars/spark
COPY --from=stream-deps /opt/venv /opt/venv
COPY --from=wheel /wheels /tmp/wheels
# `pip install txnwatch[stream,msk]`, from what stream-deps installed (--no-index: as in the collector target).
RUN whl="$(echo /tmp/wheels/*.whl)" \
    && /opt/venv/bin/pip install --no-cache-dir --no-index "${whl}[stream,msk]" && rm -rf /tmp/wheels
# The SparkApplication's mainApplicationFile (local:///opt/txnwatch/txnwatch_cli.py).
COPY txnwatch_cli.py /opt/txnwatch/txnwatch_cli.py
COPY --chmod=0755 deploy/image/entrypoint.sh /opt/txnwatch/entrypoint.sh
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
# Last, so that a new revision reuses every layer above (docker's cache keys RUN steps on the ARGs before them).
ARG VERSION=0.2.0
ARG REVISION=
ARG SOURCE=
LABEL org.opencontainers.image.title="txnwatch" \
      org.opencontainers.image.description="txnwatch: the collector, the Spark streaming job and its executors" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
